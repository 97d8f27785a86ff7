"""transfer.lua: move due entries from a queue's ZSET to its ready queue in one atomic
call (due order, offer order within a millisecond, at most `limit`), with its duties: the
transfer lease (one consumer per queue transfers; others are told who holds it and until
when), the hand-off of moved messages to the caller's ack set when the ready queue was
empty, idle registration and wake-ups, dead letters for entries without their payload,
the dedupe window of moved members, dedupe keys released or held for their ttl (throttle
windows), periodic chaining, and the backup list's upkeep (head trim and compaction)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import next_sort_key, next_sort_keys, sort_key_at
from dramatiq_redisson._keys import QueueKeys, lane_id

from .pubsub import listening
from .state import Lua, schedule_entry, turn_flow_on

RS = b"\x1e"
WORKER = "w1"
FAR = 9_000_000_000_000


def _transfer_keys(keys: QueueKeys, worker: str = WORKER) -> list[str]:
    return [
        keys.timeout_zset,
        keys.backup_list,
        keys.payloads,
        keys.compact_list,
        keys.compact_cursor,
        keys.ready,
        keys.ready_msgs,
        keys.xq,
        keys.xq_msgs,
        keys.lease,
        keys.consumers,
        keys.idle,
        keys.channel,
        keys.acks(worker),
        keys.sent,
        keys.dedupe,
        keys.keyed,
        keys.holds,
        keys.throttle_copies,
        keys.chains,
        keys.schedule_state,
        keys.paused,
        keys.fetched,
    ]


def _transfer(
    lua: Lua,
    keys: QueueKeys,
    *,
    limit: int = 100,
    trim: int = 100,
    step: int = 100,
    slack: int = 100,
    token: str = "",
    lease_ms: int = 0,
    own_slots: int = 0,
    listening: bool = False,
    compare: bool = False,
    window: int = 0,
    upkeep: int = 0,
    grace: int = 1_000,
    low_water: int = 0,
    flow: bool = False,
) -> list[Any]:
    args: list[Any] = [
        limit,
        trim,
        step,
        slack,
        token,
        lease_ms,
        own_slots,
        ("2" if compare else "1") if listening else "",
        window,
        json.dumps(keys.queue_name),
        upkeep,
        grace,
        low_water,
        f"{WORKER}|{token}",
    ]
    transfer_keys = _transfer_keys(keys)
    if flow:
        transfer_keys += keys.flow_keys
        args += keys.flow_affixes
    return list(lua("transfer")(keys=transfer_keys, args=args))


# -- moving due entries --------------------------------------------------------------


def test_transfer_of_an_empty_queue_moves_nothing_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    moved, next_due, now_us, dead, lease_until, handed, registered, lateness, holder, attend = _transfer(lua, keys)
    assert (moved, next_due, dead, lease_until, handed, registered, lateness, holder, attend) == (
        0,
        -1,
        0,
        0,
        [],
        0,
        [],
        b"",
        [],
    )
    assert before * 1000 <= now_us <= (server_ms() + 1) * 1000
    assert redis_client.dbsize() == 0


def test_transfer_moves_due_entries_in_due_order_then_offer_order_and_reports_lateness(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    sort_keys = next_sort_keys(4)
    # Offered: c (due later), then z, y, x due in one millisecond; and one not yet due.
    c = schedule_entry(redis_client, keys, "c", now - 100, sort_key=sort_keys[0]).member
    z = schedule_entry(redis_client, keys, "z", now - 500, sort_key=sort_keys[1]).member
    y = schedule_entry(redis_client, keys, "y", now - 500, sort_key=sort_keys[2]).member
    x = schedule_entry(redis_client, keys, "x", now - 500, sort_key=sort_keys[3]).member
    later = schedule_entry(redis_client, keys, "later", FAR).member
    reply = _transfer(lua, keys)
    moved, next_due, now_us, dead, _, handed, _, lateness, _, _ = reply
    assert (moved, next_due, dead, handed) == (4, FAR, 0, [])
    assert redis_client.lrange(keys.ready, 0, -1) == [z, y, x, c]
    now_ms = now_us // 1000
    assert lateness == [now_ms - (now - 500)] * 3 + [now_ms - (now - 100)]
    # They left the schedule: ZSET and payloads; the ready copies are keyed by member.
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [later]
    assert list(redis_client.hgetall(keys.payloads)) == [b"later"]
    assert set(redis_client.hgetall(keys.ready_msgs)) == {z, y, x, c}


@pytest.mark.parametrize("limit", [1, 2])
def test_transfer_moves_at_most_limit_entries_and_reports_the_next_due_time(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int], limit: int
) -> None:
    now = server_ms()
    members = [schedule_entry(redis_client, keys, f"m{i}", now - 300 + i).member for i in range(3)]
    moved, next_due, *_ = _transfer(lua, keys, limit=limit)
    assert moved == limit
    assert redis_client.lrange(keys.ready, 0, -1) == members[:limit]
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == members[limit:]
    assert next_due == now - 300 + limit  # still due: the caller transfers again at once


def test_transfer_before_anything_is_due_moves_nothing_and_reports_the_head(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "m1", FAR + 5)
    schedule_entry(redis_client, keys, "m2", FAR)
    moved, next_due, *_ = _transfer(lua, keys)
    assert (moved, next_due) == (0, FAR)
    assert redis_client.zcard(keys.timeout_zset) == 2
    assert redis_client.exists(keys.ready, keys.ready_msgs) == 0


def test_transfer_writes_compact_payloads_back_as_json_naming_queue_member_and_message_id(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    stamp = 1_700_000_000_000
    sort_key = sort_key_at(stamp)
    compact = RS + b"noop" + RS + b"[1,2]" + RS + b"" + RS + b'{"max_retries":3}' + RS + b"@25"
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1, data=compact, sort_key=sort_key).member
    plain = schedule_entry(redis_client, keys, "m2", server_ms() - 1, data=b'{"actor_name":"a","options":{}}').member
    raw = schedule_entry(redis_client, keys, "m3", server_ms() - 1, data=RS + RS + RS + b"raw bytes").member
    assert _transfer(lua, keys)[0] == 3
    ready = redis_client.hgetall(keys.ready_msgs)
    assert json.loads(ready[member]) == {
        "queue_name": "default",
        "actor_name": "noop",
        "args": [1, 2],
        "kwargs": {},
        "options": {"redis_message_id": member.decode(), "max_retries": 3},
        "message_id": "m1",
        "message_timestamp": stamp + 25,
    }
    assert list(json.loads(ready[member])["options"]) == ["redis_message_id", "max_retries"]
    assert ready[plain] == b'{"actor_name":"a","options":{"redis_message_id":"' + plain + b'"}}'
    assert ready[raw] == RS + b"raw bytes"


def test_transfer_sends_entries_without_their_payload_to_the_dead_letters(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    lost = schedule_entry(redis_client, keys, "lost", now - 10).member
    redis_client.hdel(keys.payloads, "lost")
    # A payload of another member (the id was rescheduled under a new sort key meanwhile).
    stale = schedule_entry(redis_client, keys, "stale", now - 10).member
    redis_client.hset(keys.payloads, "stale", next_sort_key().encode() + b"newer")
    good = schedule_entry(redis_client, keys, "good", now - 10).member
    moved, _, now_us, dead, *_ = _transfer(lua, keys)
    assert (moved, dead) == (1, 2)
    assert redis_client.lrange(keys.ready, 0, -1) == [good]
    assert redis_client.zrange(keys.xq, 0, -1, withscores=True) == sorted(
        [(lost, float(now_us // 1000)), (stale, float(now_us // 1000))], key=lambda pair: pair[0]
    )
    stored = redis_client.hget(keys.xq_msgs, stale)
    assert redis_client.hget(keys.xq_msgs, lost) == lost
    assert stored is not None and stored.endswith(b"newer")
    assert redis_client.zcard(keys.timeout_zset) == 0


# -- hand-off, idle registration and wake-ups ----------------------------------------


def test_transfer_hands_off_up_to_the_callers_free_slots_when_the_ready_queue_was_empty(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    members = [schedule_entry(redis_client, keys, f"m{i}", now - 10 + i).member for i in range(3)]
    reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=2, listening=True)
    moved, _, now_us, _, _, handed, registered, *_ = reply
    assert moved == 3
    ready = redis_client.hgetall(keys.ready_msgs)
    assert handed == [members[0], ready[members[0]], members[1], ready[members[1]]]
    assert redis_client.smembers(keys.acks(WORKER)) == {members[0], members[1]}
    record = f"{now_us // 1000}|{WORKER}|t1".encode()
    assert redis_client.hgetall(keys.fetched) == {members[0]: record, members[1]: record}
    assert redis_client.lrange(keys.ready, 0, -1) == [members[2]]
    # Listed at 0: nothing left to start, but an ack raises it again (ack.lua).
    assert registered == 1
    assert redis_client.zscore(keys.idle, "t1") == 0


def test_transfer_queues_behind_a_non_empty_ready_queue_without_hand_off(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.rpush(keys.ready, "g-waiting")
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1).member
    reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=5, listening=True)
    assert (reply[0], reply[5], reply[6]) == (1, [], 0)
    assert redis_client.lrange(keys.ready, 0, -1) == [b"g-waiting", member]
    assert redis_client.exists(keys.acks(WORKER), keys.fetched) == 0


def test_transfer_hands_nothing_off_while_the_queue_is_paused(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.paused, server_ms())
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1).member
    reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=5, listening=True)
    assert (reply[0], reply[5]) == (1, [])
    assert redis_client.lrange(keys.ready, 0, -1) == [member]
    assert redis_client.exists(keys.acks(WORKER), keys.fetched) == 0


def test_transfer_registers_a_listening_caller_with_slots_left_as_idle(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    schedule_entry(redis_client, keys, "m1", server_ms() - 1)
    reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=3, listening=True)
    assert (reply[0], len(reply[5]), reply[6]) == (1, 2, 1)
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"t1", 2.0)]
    # Not listening: it is taken off the idle set instead.
    schedule_entry(redis_client, keys, "m2", server_ms() - 1)
    reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=3, listening=False)
    assert (reply[0], reply[6]) == (1, 0)
    assert redis_client.zcard(keys.idle) == 0


def test_transfer_wakes_idle_consumers_for_the_messages_the_caller_does_not_take(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.wake_channel("busy"))
    assert pubsub.get_message(timeout=1.0) is None
    try:
        # "gone" has the most free slots but nobody listens on its channel: dropped, skipped.
        redis_client.zadd(keys.idle, {"gone": 9, "busy": 4, "spare": 1})
        for i in range(3):
            schedule_entry(redis_client, keys, f"m{i}", server_ms() - 1)
        assert _transfer(lua, keys, own_slots=0)[0] == 3
        message = pubsub.get_message(timeout=1.0)
        assert message is not None and message["data"] == b"0"
        # "busy" covers all three: "spare" stays idle.
        assert redis_client.zrange(keys.idle, 0, -1) == [b"spare"]
    finally:
        pubsub.close()


# -- the lease -----------------------------------------------------------------------


def test_transfer_with_a_token_takes_the_free_lease(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    reply = _transfer(lua, keys, token="t1", lease_ms=30_000)
    now_ms = reply[2] // 1000
    assert (reply[4], reply[8]) == (0, b"")
    assert redis_client.get(keys.lease) == f"t1 {now_ms + 30_000}".encode()
    assert 29_000 < redis_client.pttl(keys.lease) <= 30_000
    assert redis_client.zrange(keys.consumers, 0, -1, withscores=True) == [(b"t1", float(now_ms))]


def test_transfer_while_another_consumer_holds_the_lease_only_records_the_caller(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.lease, "t1 9000000000000", px=30_000)
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1).member
    reply = _transfer(lua, keys, token="t2", lease_ms=30_000, own_slots=5)
    now_ms = reply[2] // 1000
    assert reply[:2] == [0, -1]
    assert reply[3:] == [0, 9_000_000_000_000, [], 0, [], b"t1", []]
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [member]
    assert redis_client.exists(keys.ready) == 0
    assert redis_client.get(keys.lease) == b"t1 9000000000000"
    assert redis_client.zrange(keys.consumers, 0, -1, withscores=True) == [(b"t2", float(now_ms))]


def test_transfer_without_a_token_moves_whoever_holds_the_lease(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.lease, "t1 9000000000000", px=30_000)
    schedule_entry(redis_client, keys, "m1", server_ms() - 1)
    reply = _transfer(lua, keys, own_slots=0)
    assert (reply[0], reply[4], reply[8]) == (1, 0, b"")
    assert redis_client.get(keys.lease) == b"t1 9000000000000"
    assert redis_client.exists(keys.consumers) == 0


def test_transfer_by_the_holder_renews_the_lease_only_once_a_third_has_passed(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    fresh = f"t1 {server_ms() + 30_000}"
    redis_client.set(keys.lease, fresh, px=30_000)
    assert _transfer(lua, keys, token="t1", lease_ms=30_000)[4] == 0
    assert redis_client.get(keys.lease) == fresh.encode()  # not renewed yet
    assert redis_client.exists(keys.consumers) == 0
    # Half left (less than two thirds): renewed, and consumers unseen for three leases are dropped.
    now = server_ms()
    redis_client.set(keys.lease, f"t1 {now + 15_000}", px=15_000)
    redis_client.zadd(keys.consumers, {"stale": now - 100_000, "recent": now - 50_000})
    reply = _transfer(lua, keys, token="t1", lease_ms=30_000)
    now_ms = reply[2] // 1000
    assert redis_client.get(keys.lease) == f"t1 {now_ms + 30_000}".encode()
    assert dict(redis_client.zrange(keys.consumers, 0, -1, withscores=True)) == {
        b"recent": float(now - 50_000),
        b"t1": float(now_ms),
    }


# -- the dedupe window and dedupe keys -----------------------------------------------


def test_transfer_remembers_moved_members_for_the_dedupe_window_and_trims_older_ones(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    redis_client.zadd(keys.sent, {"g-old": now - 120_000, "g-recent": now - 1_000})
    member = schedule_entry(redis_client, keys, "m1", now - 1).member
    reply = _transfer(lua, keys, window=60_000)
    now_ms = reply[2] // 1000
    assert dict(redis_client.zrange(keys.sent, 0, -1, withscores=True)) == {
        b"g-recent": float(now - 1_000),
        member: float(now_ms),
    }
    assert 59_000 < redis_client.pttl(keys.sent) <= 60_000


def test_transfer_between_upkeep_ticks_keeps_old_moved_members(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.compact_cursor, "-", px=60_000)  # the next upkeep tick is a minute away
    redis_client.zadd(keys.sent, {"g-old": server_ms() - 120_000})
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1).member
    assert _transfer(lua, keys, window=60_000, upkeep=60_000)[0] == 1
    assert set(redis_client.zrange(keys.sent, 0, -1)) == {b"g-old", member}


def test_transfer_without_a_dedupe_window_remembers_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    schedule_entry(redis_client, keys, "m1", server_ms() - 1)
    assert _transfer(lua, keys, window=0)[0] == 1
    assert redis_client.exists(keys.sent) == 0


def test_transfer_releases_a_moved_messages_key_or_holds_it_for_its_ttl(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    schedule_entry(redis_client, keys, "free", now - 1)
    held = schedule_entry(redis_client, keys, "held", now - 1).member
    schedule_entry(redis_client, keys, "later", FAR)
    redis_client.hset(keys.dedupe, mapping={"k-free": "free", "k-held": "held", "k-later": "later"})
    redis_client.hset(keys.keyed, mapping={"free": "0:k-free", "held": "60000:k-held", "later": "5:k-later"})
    # An ended window is trimmed on the way.
    redis_client.zadd(keys.holds, {"k-ended": now - 5})
    redis_client.hset(keys.throttle_copies, "k-ended", "ran")
    reply = _transfer(lua, keys)
    now_ms = reply[2] // 1000
    assert reply[0] == 2
    assert redis_client.hgetall(keys.dedupe) == {b"k-later": b"later"}
    assert redis_client.hgetall(keys.keyed) == {b"later": b"5:k-later"}
    assert redis_client.zrange(keys.holds, 0, -1, withscores=True) == [(b"k-held", float(now_ms + 60_000))]
    assert redis_client.hgetall(keys.throttle_copies) == {b"k-held": redis_client.hget(keys.ready_msgs, held)}
    assert 59_000 < redis_client.pttl(keys.holds) <= 60_000
    assert 59_000 < redis_client.pttl(keys.throttle_copies) <= 60_000


def test_transfer_of_a_dead_lettered_keyed_entry_releases_its_key_without_a_window(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    schedule_entry(redis_client, keys, "lost", server_ms() - 1)
    redis_client.hdel(keys.payloads, "lost")
    redis_client.hset(keys.dedupe, "k", "lost")
    redis_client.hset(keys.keyed, "lost", "60000:k")
    assert _transfer(lua, keys)[3] == 1
    assert redis_client.exists(keys.dedupe, keys.keyed, keys.holds, keys.throttle_copies) == 0


# -- periodic ticks ------------------------------------------------------------------


def _tick(client: redis.Redis, keys: QueueKeys, name: str, tick: int, following: list[int]) -> bytes:
    message_id = f"periodic:{name}:{tick}"
    member = schedule_entry(
        client,
        keys,
        message_id,
        tick,
        data=RS + b"job" + RS + b"[]" + RS + RS + RS + str(tick).encode(),
        sort_key=sort_key_at(tick),
    ).member
    client.hset(keys.chains, name, member)
    client.hset(keys.schedule_state, f"{name}|t", ",".join(map(str, following)))
    return member


def test_transfer_of_a_chained_tick_runs_it_and_schedules_the_next_one(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    nxt, after = tick + 60_000, tick + 120_000
    member = _tick(redis_client, keys, "hourly", tick, [tick - 5, nxt, after])  # earlier times are skipped
    reply = _transfer(lua, keys, grace=60_000, low_water=0)
    moved, next_due, now_us, *_, attend = reply
    assert (moved, next_due, attend) == (1, nxt, [])
    assert redis_client.lrange(keys.ready, 0, -1) == [member]
    next_member = (sort_key_at(nxt) + f"periodic:hourly:{nxt}").encode()
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(next_member, float(nxt))]
    assert redis_client.lrange(keys.backup_list, 0, -1)[-1] == next_member
    assert redis_client.hget(keys.payloads, f"periodic:hourly:{nxt}") == (
        sort_key_at(nxt).encode() + RS + b"job" + RS + b"[]" + RS + RS + RS + str(nxt).encode()
    )
    assert redis_client.hgetall(keys.chains) == {b"hourly": next_member}
    assert redis_client.hgetall(keys.schedule_state) == {
        b"hourly|t": str(after).encode(),
        b"hourly|r": str(tick).encode(),
        b"hourly|l": str(now_us // 1000 - tick).encode(),
        b"hourly|n": b"1",  # runs enqueued
    }


def test_transfer_of_a_chained_tick_running_low_on_times_names_its_schedule(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    _tick(redis_client, keys, "hourly", tick, [tick + 60_000, tick + 120_000])
    assert _transfer(lua, keys, grace=60_000, low_water=2)[9] == [b"hourly"]


def test_transfer_of_a_chained_tick_without_further_times_runs_it_and_stops_the_chain(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    _tick(redis_client, keys, "once", tick, [])
    reply = _transfer(lua, keys, grace=60_000)
    assert (reply[0], reply[9]) == (1, [b"once"])
    assert redis_client.exists(keys.chains, keys.timeout_zset, keys.payloads) == 0
    assert redis_client.hget(keys.schedule_state, "once|s") == str(tick + 1).encode()


def test_transfer_of_a_late_chained_tick_does_not_run_it_and_records_where_the_chain_stopped(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 5_000
    _tick(redis_client, keys, "hourly", tick, [tick + 3_600_000])
    reply = _transfer(lua, keys, grace=1_000)
    assert (reply[0], reply[3], reply[7], reply[9]) == (0, 0, [], [b"hourly"])
    assert redis_client.exists(keys.ready, keys.ready_msgs, keys.chains, keys.timeout_zset, keys.payloads) == 0
    assert redis_client.hget(keys.schedule_state, "hourly|s") == str(tick).encode()
    assert redis_client.hget(keys.schedule_state, "hourly|t") == str(tick + 3_600_000).encode()


def test_transfer_of_a_tick_that_is_not_its_chains_moves_as_an_ordinary_message(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 5_000  # late, but a retry of a tick (not chained): it runs
    member = _tick(redis_client, keys, "hourly", tick, [tick + 60_000])
    redis_client.hset(keys.chains, "hourly", "another member")
    reply = _transfer(lua, keys)
    assert (reply[0], reply[9]) == (1, [])
    assert redis_client.lrange(keys.ready, 0, -1) == [member]
    assert redis_client.zcard(keys.timeout_zset) == 0
    assert redis_client.hget(keys.chains, "hourly") == b"another member"


def test_transfer_of_a_chained_tick_with_jitter_schedules_the_next_at_its_offset_under_its_own_time(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    nxt, after = tick + 60_000, tick + 120_000
    _tick(redis_client, keys, "spread", tick, [])
    redis_client.hset(keys.schedule_state, "spread|t", f"{nxt}+737,{after}+12")
    moved, next_due, *_ = _transfer(lua, keys, grace=60_000)
    # Then the next tick keeps its time in its id, sort key and timestamp; only its due time moves
    next_member = (sort_key_at(nxt) + f"periodic:spread:{nxt}").encode()
    assert (moved, next_due) == (1, nxt + 737)
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(next_member, float(nxt + 737))]
    assert redis_client.hget(keys.payloads, f"periodic:spread:{nxt}").endswith(RS + str(nxt).encode())
    assert redis_client.hget(keys.schedule_state, "spread|t") == f"{after}+12".encode()


def test_transfer_of_a_tick_whose_previous_run_is_in_flight_skips_it_counts_it_and_chains_the_next(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    member = _tick(redis_client, keys, "slow", tick, [tick + 1_000])
    redis_client.hset(keys.schedule_state, mapping={"slow|o": "skip", "slow|u": "previous-run"})
    redis_client.hset(keys.ready_msgs, "previous-run", "{}")  # ready or in flight, not acked
    reply = _transfer(lua, keys, grace=60_000)
    assert (reply[0], reply[9]) == (0, [])
    assert redis_client.lrange(keys.ready, 0, -1) == []
    assert redis_client.hkeys(keys.ready_msgs) == [b"previous-run"]
    assert redis_client.hget(keys.payloads, f"periodic:slow:{tick}") is None
    state = redis_client.hgetall(keys.schedule_state)
    assert (state[b"slow|k"], state[b"slow|u"], b"slow|r" in state, b"slow|n" in state) == (
        b"1",
        b"previous-run",
        False,
        False,
    )
    assert (
        redis_client.hget(keys.chains, "slow") == (sort_key_at(tick + 1_000) + f"periodic:slow:{tick + 1_000}").encode()
    )
    # When the previous run is done (acked), the next tick runs and becomes the current run
    redis_client.hdel(keys.ready_msgs, "previous-run")
    redis_client.zadd(keys.timeout_zset, {redis_client.hget(keys.chains, "slow"): tick})
    redis_client.hset(keys.schedule_state, "slow|t", str(tick + 2_000))
    assert _transfer(lua, keys, grace=60_000)[0] == 1
    current = redis_client.hget(keys.schedule_state, "slow|u")
    assert current == (sort_key_at(tick + 1_000) + f"periodic:slow:{tick + 1_000}").encode() != member


def test_transfer_of_a_tick_whose_previous_run_waits_as_a_retry_skips_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    earlier = f"periodic:slow:{tick - 1_000}"
    _tick(redis_client, keys, "slow", tick, [tick + 1_000])
    retry = schedule_entry(redis_client, keys, earlier, tick + 30_000).member  # Retries re-enqueued it
    redis_client.hset(keys.schedule_state, mapping={"slow|o": "skip", "slow|u": sort_key_at(tick - 1_000) + earlier})
    assert _transfer(lua, keys, grace=60_000)[0] == 0
    assert redis_client.hget(keys.schedule_state, "slow|k") == b"1"
    # When the retry moves, it is the schedule's current run
    redis_client.zadd(keys.timeout_zset, {retry: tick})
    assert _transfer(lua, keys, grace=60_000)[0] == 1
    assert redis_client.hget(keys.schedule_state, "slow|u") == retry


def test_transfer_of_the_run_that_reaches_the_limit_ends_the_schedule_and_names_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    tick = server_ms() - 10
    member = _tick(redis_client, keys, "thrice", tick, [tick + 1_000, tick + 2_000])
    redis_client.hset(keys.schedule_state, mapping={"thrice|m": "3", "thrice|n": "2"})
    reply = _transfer(lua, keys, grace=60_000)
    assert (reply[0], reply[9]) == (1, [b"thrice"])
    assert redis_client.lrange(keys.ready, 0, -1) == [member]
    assert redis_client.exists(keys.chains, keys.timeout_zset, keys.payloads) == 0
    state = redis_client.hgetall(keys.schedule_state)
    assert (state[b"thrice|n"], state[b"thrice|e"], b"thrice|s" in state) == (b"3", b"limit", False)


# -- the backup list's upkeep --------------------------------------------------------


def test_transfer_trims_dead_entries_from_the_head_of_the_backup_list_within_its_budget(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    dead = [f"{next_sort_key()}gone{i}".encode() for i in range(5)]
    redis_client.rpush(keys.backup_list, *dead)
    kept = schedule_entry(redis_client, keys, "kept", FAR).member
    redis_client.rpush(keys.backup_list, dead[0])  # a dead entry behind a live one stays
    _transfer(lua, keys, trim=3, slack=100)
    assert redis_client.lrange(keys.backup_list, 0, -1) == [*dead[3:], kept, dead[0]]
    _transfer(lua, keys, trim=3, slack=100)
    assert redis_client.lrange(keys.backup_list, 0, -1) == [kept, dead[0]]


def test_transfer_between_upkeep_ticks_leaves_the_backup_list_alone(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    dead = f"{next_sort_key()}gone".encode()
    redis_client.rpush(keys.backup_list, dead)
    schedule_entry(redis_client, keys, "kept", FAR)
    _transfer(lua, keys, upkeep=60_000)  # a tick: trims, then marks the next one
    assert redis_client.get(keys.compact_cursor) == b"-"
    assert 59_000 < redis_client.pttl(keys.compact_cursor) <= 60_000
    redis_client.lpush(keys.backup_list, dead)
    _transfer(lua, keys, upkeep=60_000)
    assert redis_client.lindex(keys.backup_list, 0) == dead


def test_transfer_compacts_a_backup_list_far_longer_than_the_schedule_step_by_step(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    live = [schedule_entry(redis_client, keys, f"live{i}", FAR + i).member for i in range(2)]
    # Live entries first (no head trim), then dead ones interleaved: 2 live, 6 dead.
    dead = [f"{next_sort_key()}gone{i}".encode() for i in range(6)]
    redis_client.delete(keys.backup_list)
    redis_client.rpush(keys.backup_list, live[0], dead[0], dead[1], live[1], *dead[2:])
    # 8 > 2 * 2 + 1: a pass starts at this tick.
    _transfer(lua, keys, step=3, slack=1)
    assert redis_client.get(keys.compact_cursor) == b"0"
    _transfer(lua, keys, step=3, slack=1)
    assert redis_client.get(keys.compact_cursor) == b"3"
    assert redis_client.lrange(keys.compact_list, 0, -1) == [live[0]]
    _transfer(lua, keys, step=3, slack=1)
    _transfer(lua, keys, step=3, slack=1)
    # The pass reached the end: the lists were swapped and the cursor is gone.
    assert redis_client.lrange(keys.backup_list, 0, -1) == live
    assert redis_client.exists(keys.compact_list, keys.compact_cursor) == 0
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == live


# -- lanes (flow control) ---------------------------------------------------------------


def test_with_the_flow_keys_but_flow_off_a_transfer_hands_off_as_before(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    member = schedule_entry(redis_client, keys, "m1", 1_000).member
    reply = _transfer(lua, keys, token="tok", lease_ms=10_000, own_slots=5, flow=True)
    assert reply[0] == 1
    assert reply[5][0] == member  # handed off
    assert redis_client.exists(keys.flow, keys.levels, keys.ring(0)) == 0


def test_with_flow_on_due_messages_go_to_their_lanes_and_nothing_is_handed_off(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    high = lane_id(5, "acme")
    plain = schedule_entry(redis_client, keys, "plain", 1_000).member
    laned = schedule_entry(redis_client, keys, "laned", 1_001).member
    redis_client.hset(keys.lane_of, "laned", high)
    reply = _transfer(lua, keys, token="tok", lease_ms=10_000, own_slots=5, flow=True)
    assert reply[0] == 2
    assert reply[5] == []  # nothing handed off
    assert redis_client.lrange(keys.lane(high), 0, -1) == [laned]
    assert redis_client.lrange(keys.ready, 0, -1) == [plain]
    assert redis_client.lrange(keys.ring(5), 0, -1) == [high.encode()]
    assert redis_client.exists(keys.ring(0)) == 0  # the plain lane joins ring 0 in the fetch
    assert redis_client.exists(keys.lane_of) == 0  # the lane moved with the message
    assert redis_client.scard(keys.acks(WORKER)) == 0


# -- placement (issue 46) ----------------------------------------------------------------


def test_a_caller_with_busy_threads_hands_itself_only_what_it_can_start_before_the_idlest_other(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    # The caller can start 3; "b" is listed with 2, "c" with 1. One message at a time to
    # whoever can start more, ties to the other: t1 (3 > 2), b (2 vs 2), t1 (2 > 1), b, then
    # both at 1: b's turn again, then t1 (1 > 0). So t1 takes 3 and the other 3 wake b and c.
    now = server_ms()
    members = [schedule_entry(redis_client, keys, f"m{i}", now - 10 + i).member for i in range(6)]
    redis_client.zadd(keys.idle, {"b": 2, "c": 1})
    with listening(redis_client, keys.wake_channel("b"), keys.wake_channel("c"), keys.wake_channel("t1")) as got:
        reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=3, listening=True, compare=True)
        woken = got()
    moved, _, _, _, _, handed, registered, *_ = reply
    assert moved == 6
    assert handed[0::2] == members[:3]
    assert redis_client.lrange(keys.ready, 0, -1) == members[3:]
    assert sorted(channel for channel, _ in woken) == sorted([keys.wake_channel("b"), keys.wake_channel("c")])
    assert registered == 1
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"t1", 0.0)]


def test_a_caller_with_busy_threads_leaves_a_message_to_an_idler_consumer(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1).member
    redis_client.zadd(keys.idle, {"b": 2, "t1": 1})  # the caller's own old entry is not "the other"
    with listening(redis_client, keys.wake_channel("b"), keys.wake_channel("t1")) as got:
        reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=2, listening=True, compare=True)
        woken = got()
    assert (reply[0], reply[5]) == (1, [])
    assert redis_client.lrange(keys.ready, 0, -1) == [member]
    assert woken == [(keys.wake_channel("b"), b"0")]
    # Still listed, with all it can start: the caller's threads are idle enough for the next.
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"t1", 2.0)]


def test_a_caller_whose_threads_are_all_idle_takes_what_it_can_start_without_reading_the_registry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    members = [schedule_entry(redis_client, keys, f"m{i}", server_ms() - 5 + i).member for i in range(2)]
    redis_client.zadd(keys.idle, {"b": 4})
    reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=2, listening=True)
    assert reply[5][0::2] == members
    assert redis_client.zscore(keys.idle, "b") == 4  # not woken


def test_wake_ups_pass_over_busy_consumers_and_keep_them_listed(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    # Every thread of the fleet is busy (listed at 0): nobody is woken, nobody is dropped;
    # the message waits in the ready queue for the first ack (ack.lua).
    member = schedule_entry(redis_client, keys, "m1", server_ms() - 1).member
    redis_client.zadd(keys.idle, {"b": 0, "c": 0})
    with listening(redis_client, keys.wake_channel("b"), keys.wake_channel("c")) as got:
        reply = _transfer(lua, keys, token="t1", lease_ms=10_000, own_slots=0, listening=True)
        woken = got()
    assert reply[0] == 1 and woken == []
    assert redis_client.lrange(keys.ready, 0, -1) == [member]
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"b", 0.0), (b"c", 0.0)]
